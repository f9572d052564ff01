"""`gptzoo sweep`: controlled ablations. A spec (gptzoo.sweep.spec) names a base recipe, the data, a budget,
the variants and the seeds; gptzoo.sweep.matching sizes matched variants; gptzoo.sweep.runner trains and
evaluates every (variant, seed) as an ordinary, resumable run; gptzoo.sweep.report and
gptzoo.sweep.plots say what each swap did. Shipped specs live in recipes/sweeps/.

Example::

    from gptzoo.sweep.runner import run_sweep
    from gptzoo.sweep.spec import read_spec

    report = run_sweep(read_spec("norm-placement"), "sweeps/norm-placement")
    report["variants"][0]["final_val_loss"]
"""
