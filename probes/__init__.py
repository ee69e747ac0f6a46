"""srtscope probes: the stage taxonomy, NVTX + nanosecond ranges, the recorder and its exporters.

Imports nothing else of srtscope; the engine emits through it and the analyzers read its taxonomy.
"""
from srtscope.probes.ranges import disable, enable, is_enabled, stage
from srtscope.probes.recorder import CounterRecord, Recorder, SpanRecord, get_recorder
from srtscope.probes.stages import Stage, StageClass, format_message, parse_message, resolve_stage, stage_class

__all__ = [
    "Stage", "StageClass", "resolve_stage", "stage_class", "format_message", "parse_message",
    "Recorder", "get_recorder", "SpanRecord", "CounterRecord",
    "stage", "enable", "disable", "is_enabled",
]
