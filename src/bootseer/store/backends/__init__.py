"""Store backends, one module each; ``bootseer.store.urls`` picks one by URL."""
