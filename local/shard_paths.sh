# Shard-folder paths for the run.sh scripts (sourced), named once: what common/shard_format.py writes.
POOL_PARQUET=metadata_pool.parquet  # a shard folder's metadata of every kept sample (POOL_PARQUET)

pool_parquet() { echo "$1/$POOL_PARQUET"; }    # the metadata parquet of shard folder $1
is_shard_dir() { [ -f "$1/$POOL_PARQUET" ]; }  # whether $1 is a shard folder (local/make_shards.py output)
