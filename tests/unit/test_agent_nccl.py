"""nccl-tests output parsing (real table layouts) and running a binary that misbehaves."""

# The samples are nccl-tests output verbatim: wide rows and trailing blanks included.
# ruff: noqa: E501, W291

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from choreo_agents.fit import fit_alpha_beta
from choreo_agents.probes import ProbeError, nccl

SENDRECV = """\
# nThread 1 nGpus 2 minBytes 1024 maxBytes 268435456 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  40412 on dgx-a100-07 device  0 [0x07] NVIDIA A100-SXM4-80GB
#  Rank  1 Group  0 Pid  40412 on dgx-a100-07 device  1 [0x0f] NVIDIA A100-SXM4-80GB
dgx-a100-07:40412:40412 [0] NCCL INFO Bootstrap : Using eth0:10.1.7.17<0>
dgx-a100-07:40412:40412 [0] NCCL INFO cudaDriverVersion 12020
NCCL version 2.18.5+cuda12.2
dgx-a100-07:40412:40430 [1] NCCL INFO Channel 00/24 :    0   1
#
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
        1024           256     float     sum      -1    10.87    0.09    0.09      0    10.61    0.10    0.10      0
        4096          1024     float     sum      -1    10.95    0.37    0.37      0    10.78    0.38    0.38      0
       16384          4096     float     sum      -1    11.31    1.45    1.45      0    11.18    1.47    1.47      0
       65536         16384     float     sum      -1    12.42    5.28    5.28      0    12.36    5.30    5.30      0
      262144         65536     float     sum      -1    15.58   16.83   16.83      0    15.49   16.92   16.92      0
     1048576        262144     float     sum      -1    27.14   38.64   38.64      0    27.09   38.71   38.71      0
     4194304       1048576     float     sum      -1    71.95   58.29   58.29      0    71.88   58.35   58.35      0
    16777216       4194304     float     sum      -1    245.6   68.31   68.31      0    245.3   68.40   68.40      0
    67108864      16777216     float     sum      -1    941.2   71.30   71.30      0    940.8   71.33   71.33      0
   268435456      67108864     float     sum      -1   3718.9   72.18   72.18      0   3717.5   72.21   72.21      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 38.2711 
#
# Collective test concluded: sendrecv_perf
#
"""

ALLTOALL = """\
# nThread 1 nGpus 8 minBytes 1024 maxBytes 268435456 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   1841 on hgx-h100-3 device  0 [0x18] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid   1841 on hgx-h100-3 device  1 [0x2a] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid   1841 on hgx-h100-3 device  2 [0x3a] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid   1841 on hgx-h100-3 device  3 [0x5d] NVIDIA H100 80GB HBM3
#  Rank  4 Group  0 Pid   1841 on hgx-h100-3 device  4 [0x9a] NVIDIA H100 80GB HBM3
#  Rank  5 Group  0 Pid   1841 on hgx-h100-3 device  5 [0xab] NVIDIA H100 80GB HBM3
#  Rank  6 Group  0 Pid   1841 on hgx-h100-3 device  6 [0xba] NVIDIA H100 80GB HBM3
#  Rank  7 Group  0 Pid   1841 on hgx-h100-3 device  7 [0xdb] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
        1024            32     float    none      -1    24.11    0.04    0.04      0    23.97    0.04    0.04    N/A
        4096           128     float    none      -1    24.38    0.17    0.15      0    24.30    0.17    0.15    N/A
       16384           512     float    none      -1    25.02    0.65    0.57      0    24.91    0.66    0.58    N/A
       65536          2048     float    none      -1    26.89    2.44    2.13      0    26.73    2.45    2.15    N/A
      262144          8192     float    none      -1    31.74    8.26    7.23      0    31.60    8.30    7.26    N/A
     1048576         32768     float    none      -1    42.55   24.64   21.56      0    42.39   24.74   21.64    N/A
     4194304        131072     float    none      -1    64.12   65.41   57.24      0    63.98   65.56   57.36    N/A
    16777216        524288     float    none      -1    141.8  118.32  103.53      0    141.6  118.48  103.67    N/A
    67108864       2097152     float    none      -1    462.7  145.04  126.91      0    462.1  145.23  127.07    N/A
   268435456       8388608     float    none      -1   1760.3  152.50  133.43      0   1759.6  152.56  133.49    N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 45.6512 
#
"""

OLD_LAYOUT = """\
# nThread 1 nGpus 2 minBytes 8 maxBytes 1048576 step: 8(factor) warmup iters: 5 iters: 20 validation: 1
#
#                                                     out-of-place                       in-place
#       size         count      type     redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                          (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float       sum    12.21    0.00    0.00  0e+00    12.04    0.00    0.00  0e+00
        4096          1024     float       sum    12.90    0.32    0.32  0e+00    12.85    0.32    0.32  0e+00
     1048576        262144     float       sum    38.72   27.08   27.08  0e+00    38.70   27.09   27.09  0e+00
 Out of bounds values : 0 OK
 Avg bus bandwidth    : 9.1329
"""


def test_sendrecv_table_is_parsed_and_fits_the_link() -> None:
    result = nccl.parse(SENDRECV)
    assert [r.size for r in result.rows][:3] == [1024, 4096, 16384]
    assert len(result.rows) == 10
    assert result.rows[-1].time_us == pytest.approx(3718.9)
    assert result.rows[-1].in_place_time_us == pytest.approx(3717.5)
    assert result.avg_bus_bandwidth_gbs == pytest.approx(38.2711)
    assert result.dropped == [] and result.errors == []
    samples = result.samples()
    assert len(samples) == 20
    fit = fit_alpha_beta(samples.sizes, samples.times)
    assert fit.bandwidth == pytest.approx(72.2e9, rel=0.05)
    assert 9e-6 < fit.alpha < 12e-6


def test_alltoall_scales_sizes_to_bytes_per_link_and_accepts_na_checks() -> None:
    result = nccl.parse(ALLTOALL)
    assert len(result.rows) == 10
    assert all(r.in_place_time_us is not None for r in result.rows)
    samples = result.samples(bytes_per_size=7 / 8)
    assert samples.sizes[0] == pytest.approx(1024 * 7 / 8)
    assert result.avg_bus_bandwidth_gbs == pytest.approx(45.6512)


def test_older_layout_without_root_column_and_float_error_column() -> None:
    result = nccl.parse(OLD_LAYOUT)
    assert [r.size for r in result.rows] == [8, 4096, 1048576]
    assert result.rows[2].time_us == pytest.approx(38.72)


def test_rows_that_failed_validation_or_are_garbled_are_dropped_with_reasons() -> None:
    text = SENDRECV.replace(
        "       65536         16384     float     sum      -1    12.42    5.28    5.28      0",
        "       65536         16384     float     sum      -1    12.42    5.28    5.28      3",
    ).replace("      262144         65536     float", "      262144  garbage")
    result = nccl.parse(text)
    sizes = [r.size for r in result.rows]
    assert 262144 not in sizes
    row = next(r for r in result.rows if r.size == 65536)
    assert row.time_us == pytest.approx(12.36)  # the in-place run passed its check
    assert row.in_place_time_us is None
    assert len(result.dropped) == 1 and "columns" in result.dropped[0]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Segmentation fault (core dumped)\n",
        "# nThread 1 nGpus 2\n#  size count type redop root time algbw busbw #wrong\n",
        "\x00\x7f\x1b[31mgarbage\n12 34 56\n",
        SENDRECV.split("#       size")[0],
    ],
)
def test_output_without_usable_rows_raises(text: str) -> None:
    with pytest.raises(ProbeError, match="no usable rows"):
        nccl.parse(text)


def test_nccl_failure_lines_are_reported() -> None:
    text = (
        SENDRECV.split("        1024")[0]
        + "dgx-a100-07:40412:40412 [1] NCCL WARN Cuda failure 'an illegal memory access'\n"
        + "dgx-a100-07: Test NCCL failure common.cu:958 'unhandled cuda error'\n"
    )
    with pytest.raises(ProbeError, match="NCCL WARN"):
        nccl.parse(text)


def _tool(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_run_passes_devices_and_parses_stdout(tmp_path: Path) -> None:
    out = tmp_path / "sendrecv.txt"
    out.write_text(SENDRECV)
    tool = _tool(
        tmp_path, "sendrecv_perf", f'echo "$CUDA_VISIBLE_DEVICES $*" > {tmp_path}/args\ncat {out}\n'
    )
    result = nccl.run(tool, [2, 5])
    assert len(result.rows) == 10
    args = (tmp_path / "args").read_text()
    assert args.startswith("2,5 ") and "-g 2" in args
    assert nccl.find_tool("sendrecv_perf", [str(tmp_path)]) == tool


def test_run_reports_a_failing_binary(tmp_path: Path) -> None:
    tool = _tool(tmp_path, "sendrecv_perf", 'echo "Test CUDA failure: GPU is lost" >&2\nexit 3\n')
    with pytest.raises(ProbeError, match=r"exited 3.*GPU is lost"):
        nccl.run(tool, [0, 1])


def test_run_times_out_a_hung_binary(tmp_path: Path) -> None:
    tool = _tool(tmp_path, "sendrecv_perf", "exec sleep 30\n")
    with pytest.raises(ProbeError, match="timed out"):
        nccl.run(tool, [0, 1], timeout=0.5)


def test_missing_tool_is_none(tmp_path: Path) -> None:
    assert nccl.find_tool("alltoall_perf_does_not_exist", [str(tmp_path)]) is None
