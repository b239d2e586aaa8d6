package handler
