"""Trace files: the event schema, the JSON Lines writer and reader. No engine imports."""
from traces.schema import SCHEMA_VERSION, KINDS
from traces.writer import MemoryTrace, TraceWriter
from traces.reader import read_trace, TraceError

__all__ = ["SCHEMA_VERSION", "KINDS", "MemoryTrace", "TraceWriter", "read_trace", "TraceError"]
