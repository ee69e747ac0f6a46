"""srtscope probes: the stage taxonomy, NVTX + nanosecond ranges, the recorder and its exporters.

Imports nothing else of srtscope; the engine emits through it and the analyzers read its taxonomy.
"""
from srtscope.probes.stages import Stage, StageClass, resolve_stage, stage_class, format_message, parse_message
from srtscope.probes.recorder import Recorder, get_recorder, SpanRecord, CounterRecord
from srtscope.probes.ranges import stage, enable, disable, is_enabled

__all__ = [
    "Stage", "StageClass", "resolve_stage", "stage_class", "format_message", "parse_message",
    "Recorder", "get_recorder", "SpanRecord", "CounterRecord",
    "stage", "enable", "disable", "is_enabled",
]
