# `make train` and `make test` each build .venv first when it is missing or
# older than pyproject.toml.
VENV := .venv
PYTHON := $(VENV)/bin/python
# Eight emulated CPU devices: the tests' stand-in for a TPU host.
CPU_DEVICES := XLA_FLAGS=--xla_force_host_platform_device_count=8 \
	JAX_PLATFORMS=cpu TPU_SKIP_MDS_QUERY=1 TF_CPP_MIN_LOG_LEVEL=2

.PHONY: train test clean

$(VENV)/installed: pyproject.toml
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e '.[test]'
	touch $@

train: $(VENV)/installed
	@echo "make train: the training loop has not landed yet (issue 'Sharded training')." >&2
	@exit 1

test: $(VENV)/installed
	$(CPU_DEVICES) $(PYTHON) -m pytest -n 2 -q

clean:
	rm -rf $(VENV) workdir
