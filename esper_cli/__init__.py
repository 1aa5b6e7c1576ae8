"""The ``esper`` command line: thin entry points onto flows, benchmarks and the library."""
