"""Build hook for the one C extension; everything else is in pyproject.toml.

``srtscope.probes._fastrange`` (probes/_fastrange.c) is the probe ranges' hot path. It is
optional: where it does not compile, the install goes on and ``probes/ranges.py`` uses its pure
Python path.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("srtscope.probes._fastrange", ["probes/_fastrange.c"], optional=True)])
