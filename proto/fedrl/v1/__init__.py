"""Protocol v1 (protobuf package fedrl.v1).

The *_pb2* modules are generated; see proto/generate.py.
"""
