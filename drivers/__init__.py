"""Device drivers: transports (serial, VISA, SSH) and one thin driver per device family."""
