# client/: libkvshare, the kvshare CLI, the Python binding.
