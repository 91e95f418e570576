"""Speed: throughput, step time and memory of the pipeline's paths, each against a baseline
(bare tokenizers, transformers' models and pipeline, torch's defaults) in the same run. `make
bench` runs the ones that need no pipeline run and the prediction and serving ones."""
