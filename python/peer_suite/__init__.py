"""The peer's own RPC test suites (Debian's python3-torch), run against
tether: suites.py points them at tether, run.py runs them and reports
(docs/peer_suite.md)."""
