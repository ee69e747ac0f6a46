"""The srtscope reference engine: an SGLang-shaped runtime, instrumented at every stage."""
