"""srtscope analyzers: readers into one Timeline, and pure analyses over it.

The analyzers never import the engine; from probes they use only the stage taxonomy.
"""
