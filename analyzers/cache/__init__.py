"""Caches you can trust: the table cache, the diagnosis cache, their keys, store and
signatures.
"""
