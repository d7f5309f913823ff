"""Speech to text: audio decoded to 16 kHz mono (PyAV), Whisper-family models run on a
thread of their own, 30 s windows of concurrent requests batched together."""
