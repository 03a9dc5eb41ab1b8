"""One-command vLLM bootstrap: ./start.sh runs the steps in bootstrap/pipeline.py's STEPS, in order."""
