"""engine.scheduler: batch selection, prefill admission, policies, event loops, worker client."""
