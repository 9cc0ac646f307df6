"""Benchmarks: toolnexus against a bare redis-py floor and the Python job-queue peers.

Run ``python -m bench`` (a few minutes; rewrites ``bench/RESULTS.md`` and
``bench/results.png``) or ``python -m bench --quick`` (seconds; writes to a
temporary directory, proves the harness still runs). Every case runs against
one private ``redis-server`` that the run starts on a free loopback port.
"""
