"""TE-CCL-style engines: collectives as multi-commodity flow over a time-expanded network.

``copy`` (MILP with in-network copy, complete windows or A*-style rounds) and ``flow`` (LP
for collectives that need no copy, with a flow-to-path decomposition) both end in the common
``Schedule`` and pass the same verifier as the greedy engine. Solved with HiGHS.
"""
