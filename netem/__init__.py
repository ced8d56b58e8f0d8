"""edgespec.netem: network emulation.

- profile.py: `NetworkProfile` and `load_profile(name_or_path)` (packaged YAML in profiles/)
- relay.py / relay_thread.py: the userspace TCP relay (`Relay`, asyncio) and `RelayThread`
- shaping.py, traces.py, outages.py: the pure timing model behind the relay
- tc.py: the same profiles with tc/netem on real Linux hosts (apply, lab of two namespaces)
- measure.py: probe traffic that measures a link (round trips, throughput)
- cli.py: `edgespec netem ...`; demo.py: `edgespec demo` (server, relay and client on this machine)
- bench/: every benchmark (`edgespec bench NAME`): the experiments under emulated networks and the
  micro-benchmarks, with their shared pieces (prompt sets, server process, records, report)
"""
