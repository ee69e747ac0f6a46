"""engine.attention"""
