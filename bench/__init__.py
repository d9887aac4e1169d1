"""The benchmarks (run as scripts: see each module's docstring). A package so that the servers
the benchmarks start can import bench.bare_settings, bench.bare_urls and bench.bare_asgi."""
