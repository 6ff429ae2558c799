# Which folders of src/stitch each folder may use (include and link), in
# dependency order: the picture in docs/design.md ("Code"). stitch_library()
# refuses a link to a folder not listed here, and the `layering` test an
# #include of one, so the direction cannot be broken quietly: changing it
# means changing this table. A new folder declares its line here first. A
# folder inside another (store/s3) is named with an underscore (store_s3).
set(STITCH_FOLDERS core io format delta store store_s3 net api fetch pool engine replica gateway
    publish refengine demo chaos cli)
set(STITCH_MAY_USE_core "")
set(STITCH_MAY_USE_io core)
set(STITCH_MAY_USE_format io core)
# The delta codec, the headline feature: versions encoded against the one
# before, and the chains that apply them.
set(STITCH_MAY_USE_delta format io core)
set(STITCH_MAY_USE_store format io core)
# The S3 adapter of the Store port: a remote store, and nothing above it.
set(STITCH_MAY_USE_store_s3 store format io core)
set(STITCH_MAY_USE_net core)
# The versioned rollout API: what sidecars, gateways and engines say to each
# other over HTTP, and nothing of any of them.
set(STITCH_MAY_USE_api net core)
# Bringing remote versions to a replica: the verified cache and the peers
# before the store, through the remote-store port (store/remote_store.h).
# Only OpenStore (fetch/open_store.cc) names the S3 adapter, to put the
# cache in front of it.
set(STITCH_MAY_USE_fetch store_s3 store api net format io core)
set(STITCH_MAY_USE_pool api core)
set(STITCH_MAY_USE_engine api net delta format io core)
set(STITCH_MAY_USE_replica api engine store net delta format core)
# The gateway meets replicas only over HTTP: never the sidecar (replica) or
# the engine port (engine).
set(STITCH_MAY_USE_gateway api pool net core)
set(STITCH_MAY_USE_publish pool api store_s3 store delta format io core)
set(STITCH_MAY_USE_refengine api net delta format io core)
set(STITCH_MAY_USE_demo refengine publish pool api net store delta format io core)
# The fault-injection suite drives a fleet of processes as the demo does.
set(STITCH_MAY_USE_chaos demo refengine publish pool fetch api net store delta format io core)
set(STITCH_MAY_USE_cli chaos demo refengine publish gateway replica engine pool fetch api net
    store_s3 store delta format io core)
