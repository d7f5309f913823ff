"""Images in prompts: what the front end makes of a prompt with images (inputs.py), the
per-model processors that make it (processor.py, gemma3_processor.py), and what the model
runner does with it (engine/worker/encoder_cache.py runs the vision tower, the decoder
takes the tower's rows in place of the placeholder tokens' embeddings). docs/vision.md tells
the whole flow."""
