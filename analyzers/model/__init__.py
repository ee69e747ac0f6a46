"""The data model: the Timeline and its columns, interval primitives, names, units,
parameters and results.
"""
