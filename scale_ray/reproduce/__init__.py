"""`scale-ray reproduce`: the paper's experiments (Tables 3-5, Fig. 6) and the ones it lacks.

One run directory holds everything::

    OUT/runs/<method>_s<seed>/   training runs (resumable; a finished run is not trained again)
    OUT/results.json             every table as data, budgets, wall times, commit
    OUT/results.md               the tables (results/*/README.md cite them)
    OUT/fig6_training.png        training curves (return, response time) of all methods
    OUT/response_vs_n.png        mean task response time against N for all size-free policies

Budgets fix every number of the run (iterations, seeds, evaluation episodes, sizes); DQN and SAC
get the same number of environment steps as PPO, not the same number of iterations. Evaluation
seeds are fixed (``SeedSequence([EVAL_SEED, k])``) and never chosen after looking at results.

Modules: :mod:`.budgets` (methods and budgets), :mod:`.runs` (training runs: resume, locks,
helper processes), :mod:`.pipeline` (:func:`~.pipeline.run`: train, evaluate, write),
:mod:`.report` (statistics and the Markdown tables), :mod:`.plots` (the figures).
"""
