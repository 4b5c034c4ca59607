"""The demo: the seed's ticket flow, a worker killed mid-run, and its recovery."""
