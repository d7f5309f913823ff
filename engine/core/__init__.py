"""The engine core: requests as token ids in, sampled tokens out.

It schedules, runs the model and updates its requests, and knows nothing of text: no
tokenizer, no stop strings, no n-way requests (engine/frontend/output_processor.py does those).
"""
