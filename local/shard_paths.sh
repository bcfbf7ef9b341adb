# Shard-folder paths for the run.sh scripts (sourced), named once: what common/shard_format.py writes.
POOL_PARQUET=metadata_pool.parquet  # a shard folder's metadata of every kept sample (POOL_PARQUET)

pool_parquet() { echo "$1/$POOL_PARQUET"; }    # the metadata parquet of shard folder $1
is_shard_dir() { [ -f "$1/$POOL_PARQUET" ]; }  # whether $1 is a shard folder (local/make_shards.py output)
# shard_dir NAME PATH: where the shards of a corpus live: PATH itself when it is a shard folder, else
# $data/shards/NAME (data: the recipe's working folder)
shard_dir() { if is_shard_dir "$2"; then echo "$2"; else echo "$data/shards/$1"; fi; }
