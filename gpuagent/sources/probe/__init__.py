"""nvidia-smi: the probe and its gates, the answer's parser, the samples and their rules."""
