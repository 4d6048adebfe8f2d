"""The bench's session workloads: requests that follow one another, as agents and chat clients
send them.

- :mod:`~promptlookup.bench.sessions.conversations`: the multi-turn mode, ``promptlookup bench
  --sessions N --turns T``. Each turn sends the whole conversation so far with the method's own
  earlier answers; it measures time to first token per turn and end-to-end tokens/s, the prefix
  cache's workload, raced ``--against`` servers with their own defaults.
- :mod:`~promptlookup.bench.sessions.cross_request`: request *sequences* whose later answers
  repeat earlier ones in structure, run with the cross-request index off, per tenant and global
  (``python benchmarks/cross_request_sessions.py``).
- :mod:`~promptlookup.bench.sessions.workload`: the material both build on, read at run time
  from the installed Python standard library's sources (nothing of it is stored here).
"""
