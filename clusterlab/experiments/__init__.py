"""Ready-made, parameterised experiments that the course's notebooks call.

One file per topic; each function starts real clusters (`clusterlab.Cluster`), runs the
experiment, and returns plain data (numbers, arrays, dicts) that the notebook plots and
asserts on. Notebooks hold the story and short calls; the engine code lives here.
"""
