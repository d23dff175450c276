"""Serving a trained model over HTTP (serve.py): input spec, backends (torch, onnxruntime), the LitServe API."""
