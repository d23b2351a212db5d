"""Benchmarks of scalefree against its peers: ``scalefree bench <what>``.

Each bench is one module here with an ``add_parser(subparsers)`` function (see
:mod:`scalefree_bench.cli`); what they share (size parsing, statistics, the timed loop, the
table, JSON records and plots) lives in :mod:`scalefree_bench.common`. Results follow
``BENCHMARKS.md``: median/min/max seconds per call, one flat JSON record per point.
"""
