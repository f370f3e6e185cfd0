"""What a pipeline is: a definition validated into a typed spec, with no Spark and no
Django. ``definition`` checks a whole document (chain pipelines, the bounds one executor
holds, the cost check) and ``dataflow`` the DAG of named operators and its expressions;
both name the field of every error, so the form, the CLI and the runner give the same
one line."""
