"""srtscope command line: typer app and rich rendering only — no analysis logic."""
