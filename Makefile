# The two quick-start commands: `make demo` and `make test`. Each creates or reuses .venv.
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint

demo:
	@scripts/bootstrap.sh models
	@$(BIN)/python scripts/demo.py

test:
	@scripts/bootstrap.sh models,eval,test,distributed,postgres,hf
	@scripts/ensure_postgresql.sh
	@$(BIN)/ruff check src tests benchmarks scripts
	@$(BIN)/python -m pytest -q

lint:
	@scripts/bootstrap.sh models,test
	@$(BIN)/ruff check src tests benchmarks scripts
