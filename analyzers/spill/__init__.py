"""The spill: an export read once into time-ordered segments on disk, their packed columns,
the writes and the spill's private folder.
"""
