# The HTTP server (serve.py) for a trained checkpoint or an exported ONNX file, on CPU.
#
#   docker build -t lightning-template-serve .
#   docker run --rm -p 8000:8000 -v "$PWD/logs:/app/logs:ro" lightning-template-serve \
#       --ckpt_path logs/simple_cnn/version_0/checkpoints/last.ckpt
#   curl -F file=@shoe.png http://127.0.0.1:8000/predict
#
# CUDA: build with --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 (a CUDA base image is
# not needed: the wheels bring the CUDA runtime), run with `docker run --gpus all ...` and add
# `--accelerator cuda`. ONNX on GPU: replace onnxruntime by onnxruntime-gpu.
FROM python:3.11-slim

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
WORKDIR /app
RUN pip install --no-cache-dir --index-url "$TORCH_INDEX" torch==2.15.0 torchvision==0.29.2
COPY pyproject.toml README.md ./
COPY lightning_template lightning_template
COPY configs configs
COPY train.py export.py serve.py ./
RUN pip install --no-cache-dir '.[serve]'

# An unprivileged user; checkpoints are mounted read-only.
RUN useradd --create-home server
USER server
EXPOSE 8000
ENTRYPOINT ["python", "serve.py", "--host", "0.0.0.0", "--port", "8000"]
CMD ["--help"]
