"""The one pipeline: a trace's windows of whole steps (a whole read is one), each window's
part of every figure and the parts' combine; the first pass, the walk and its fork, the read plan
within a memory budget.
"""
