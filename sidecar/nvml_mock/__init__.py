"""A mock libnvidia-ml.so.1 (C source, build, scenario compiler) for tests, demos and kind."""
