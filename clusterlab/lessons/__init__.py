"""What each notebook reads from its runs: the verdicts, the sentences and the figures.

One module per notebook, named after it (`notebooks/06b_lock_free_updates.ipynb`
reads with `lessons/lock_free_updates.py`). The experiments (`clusterlab.experiments`)
run the clusters and return plain data; a lesson module turns that data into what the learner
sees - each sentence computed from the run, each measured conclusion passed to `conclude` -
so that a notebook's cells are the story's short calls, not bookkeeping.
"""
