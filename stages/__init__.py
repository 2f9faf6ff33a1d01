"""One module per pipeline stage: Prefect sub-flows that load inputs from MLflow, call `rlhf_lib`, and log
metrics, models, data sets and reports back to MLflow. All I/O of the pipeline lives here."""
