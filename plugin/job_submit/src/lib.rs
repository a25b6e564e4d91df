//! job_submit/bftrainer.
