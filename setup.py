"""Build hook for the C extensions; everything else is in pyproject.toml.

``srtscope.probes._fastrange`` (probes/_fastrange*.c, one module from four files sharing
probes/_fastrange.h) is the probe ranges' hot path;
``srtscope.analyzers.readers._sqlite_pages`` (analyzers/readers/_sqlite_pages.c) decodes a big nsys
export's tables from their SQLite pages; ``srtscope.analyzers.readers._kineto_times``
(analyzers/readers/_kineto_times.c) converts a Kineto trace's time literals to ns, and
``srtscope.analyzers.readers._kineto_fields`` (``_kineto_fields.c``) gathers a batch of its events'
members in one pass. All are optional:
where one does not compile, the install goes on and its Python side takes the other path
(``probes/ranges.py``'s pure Python stages; SQLite reading every table,
``analyzers/readers/sqlite_pages.py``; numpy, ``analyzers/readers/kineto_times.py``; a pass a member,
``kineto_columns.py``).
"""
from setuptools import Extension, setup

setup(ext_modules=[
    Extension("srtscope.probes._fastrange",
              ["probes/_fastrange.c", "probes/_fastrange_method.c", "probes/_fastrange_null.c",
               "probes/_fastrange_range.c"],
              depends=["probes/_fastrange.h"], optional=True),
    Extension("srtscope.analyzers.readers._sqlite_pages", ["analyzers/readers/_sqlite_pages.c"],
              extra_compile_args=["-O2"], optional=True),
    Extension("srtscope.analyzers.readers._kineto_times", ["analyzers/readers/_kineto_times.c"],
              depends=["analyzers/readers/_kineto_literal.h"], extra_compile_args=["-O2"], optional=True),
    Extension("srtscope.analyzers.readers._kineto_fields", ["analyzers/readers/_kineto_fields.c"],
              depends=["analyzers/readers/_kineto_literal.h"], extra_compile_args=["-O2"], optional=True),
])
