"""The test suite, laid out as the code is: loader/<room>/, aot/<room>/, csrc/; support/ (helpers every folder
imports as tests.support.*), probes/ (probe_*.py, run in fresh processes), gpu/ (GPU pytest files) with gpu/checks/
(the GPU check scripts device_run.sh runs) and checks/ (their CPU halves)."""
