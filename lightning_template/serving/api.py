"""The LitServe API: `POST /predict` with images or texts, answered with label names and probabilities.

Requests (one input or many per request):
    JSON       {"images": ["<base64 image file>", ...]}   or {"image": "<base64>"}
               {"texts": ["a text", ...]}                 or {"text": "a text"}
    multipart  one or more `file` fields (image files, or UTF-8 text files for a text model)
Answer:
    {"predictions": [{"label": "Sneaker", "probability": 0.93, "probabilities": {"T-shirt/top": ..., ...}}, ...],
     "batch_size": 12}
`batch_size` is how many inputs the network ran on together: LitServe gathers concurrent
requests (up to `max_batch_size` requests, waiting at most `batch_timeout` s) into one forward pass.

A bad request gets a 4xx with a message. It is answered on its own: decoding errors are kept
as values (not raised), because LitServe fails every request of a batch when one raises.
"""

from __future__ import annotations

from typing import Any

import litserve as ls
import numpy as np
from fastapi.responses import JSONResponse

from lightning_template.serving.backends import load_backend
from lightning_template.serving.preprocess import BadInput, preprocessor

UPLOAD_FIELDS = ("file", "files")
BASE64_FILE = {"type": "string", "contentEncoding": "base64", "description": "an image file (PNG, JPEG, ...)"}


def predict_openapi(field: str, max_inputs: int) -> dict[str, Any]:
    """The `POST /predict` request body for the OpenAPI schema (`/openapi.json`, `/docs`), which LitServe leaves
    empty because `decode_request` reads the raw request; `field` is the preprocessor's (`texts` or `images`)."""
    item = {"type": "string", "minLength": 1} if field == "texts" else BASE64_FILE
    one = field.removesuffix("s")
    some = {"minItems": 1, "maxItems": max_inputs}
    as_json = {
        "oneOf": [
            {"type": "object", "properties": {name: value}, "required": [name], "additionalProperties": False}
            for name, value in ((field, {"type": "array", "items": item, **some}), (one, item))
        ]
    }
    files = {"type": "array", "items": {"type": "string", "format": "binary"}, **some}
    as_form = {"type": "object", "properties": {"file": files}, "required": ["file"]}
    content = {"application/json": {"schema": as_json}, "multipart/form-data": {"schema": as_form}}
    return {"requestBody": {"required": True, "content": content}}


class ClassifierAPI(ls.LitAPI):
    def __init__(self, model_path: str, max_inputs: int = 64, **kwargs: Any) -> None:
        """`kwargs` go to LitAPI: max_batch_size, batch_timeout."""
        super().__init__(**kwargs)
        self.model_path, self.max_inputs = model_path, max_inputs

    def setup(self, device: str) -> None:
        self.backend = load_backend(self.model_path, device)
        self.preprocess = preprocessor(self.backend.spec)
        self.class_names = list(self.backend.spec["class_names"])

    # `request` has no annotation: LitServe would read it as the body's type.
    def decode_request(self, request) -> list[Any] | BadInput:
        """The request's inputs, preprocessed; or the reason they are refused."""
        try:
            return self._inputs(request)
        except BadInput as err:
            return err

    def _inputs(self, request: Any) -> list[Any]:
        field = self.preprocess.field
        one = field.removesuffix("s")
        usage = f'send {{"{field}": [...]}}, {{"{one}": ...}} or multipart `file` fields; this model takes'
        usage += f" {self.preprocess.describe()}"
        if hasattr(request, "multi_items"):  # multipart form
            items = list(request.multi_items())
            unknown = sorted({key for key, _ in items} - {*UPLOAD_FIELDS, field, one})
            values = [(value, not isinstance(value, str)) for _, value in items]
        elif isinstance(request, dict):
            unknown = sorted(set(request) - {field, one})
            if field in request and one in request:
                raise BadInput(f"both '{field}' and '{one}' given; {usage}.")
            value = request.get(field, [request[one]] if one in request else [])
            if not isinstance(value, list):
                raise BadInput(f"'{field}' must be a list; {usage}.")
            values = [(v, False) for v in value]
        else:
            raise BadInput(f"the body must be a JSON object; {usage}.")
        if unknown:
            raise BadInput(f"unknown field(s) {unknown}; {usage}.")
        if not values:
            raise BadInput(f"no inputs; {usage}.")
        if len(values) > self.max_inputs:
            raise BadInput(f"{len(values)} inputs in one request; at most {self.max_inputs}.", status=413)
        return [
            self.preprocess.from_upload(value.file.read(), i) if upload else self.preprocess.from_json(value, i)
            for i, (value, upload) in enumerate(values)
        ]

    def predict(self, requests: Any) -> Any:
        """One forward pass over every input of every request in the batch."""
        batched = self.max_batch_size > 1
        requests = requests if batched else [requests]
        good = [r for r in requests if not isinstance(r, BadInput)]
        flat = [x for inputs in good for x in inputs]
        probabilities = self.backend(self.preprocess.collate(flat)) if flat else np.empty((0, 0))
        outputs, start = [], 0
        for inputs in requests:
            if isinstance(inputs, BadInput):
                outputs.append(inputs)
                continue
            outputs.append((probabilities[start : start + len(inputs)], len(flat)))
            start += len(inputs)
        return outputs if batched else outputs[0]

    def encode_response(self, output: Any) -> Any:
        if isinstance(output, BadInput):
            return JSONResponse(status_code=output.status, content={"detail": str(output)})
        probabilities, batch_size = output
        predictions = [
            {
                "label": self.class_names[int(row.argmax())],
                "probability": float(row.max()),
                "probabilities": dict(zip(self.class_names, map(float, row), strict=True)),
            }
            for row in probabilities
        ]
        return {"predictions": predictions, "batch_size": batch_size}
