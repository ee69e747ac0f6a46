"""engine.mem"""
