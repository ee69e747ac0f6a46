"""engine.runner"""
