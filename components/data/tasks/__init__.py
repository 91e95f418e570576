"""Stage `task_data@task`: a fine-tuning task's examples, read, checked, split and written."""
