package proxy
