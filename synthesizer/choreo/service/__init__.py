"""The gRPC synthesizer service: the operator's way to get schedules without solving in-process.

See docs/service.md. ``choreo serve`` runs it; ``choreo synthesize --remote`` is its client.
"""
