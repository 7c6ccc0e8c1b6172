"""Entry point of make-models (the BERT/ResNet ONNX models): `seedance.bench.models`."""

from seedance.bench.models import main

if __name__ == "__main__":
    raise SystemExit(main())
