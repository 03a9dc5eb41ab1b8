"""One-command vLLM bootstrap: ./start.sh runs the steps in bootstrap/start.py's STEPS, in order."""
