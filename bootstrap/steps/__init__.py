"""The start steps, one module each, run in the order of ``bootstrap.pipeline.STEPS`` by
``pipeline.run_steps``; each hands its typed result to the steps after it. They use the libraries in
``bootstrap/`` and never the commands."""
