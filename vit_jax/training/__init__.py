"""The training wing: the step, the loop and what the loop calls.

step.py builds the program (model, optimizer, jitted step over the mesh);
loop.py runs it over a resolved run (resolve.py); reporting/ (progress,
timing, goodput) is where a run reports; optimizer.py, polyak.py,
preemption.py and evaluators/ are the loop's other concerns.
"""
